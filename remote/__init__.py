"""Everything outrig runs on a box (shipped in the wheel as ``outrig._box``)."""
