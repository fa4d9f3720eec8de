"""The user's files as outrig reads them, below the playbook and the host file: YAML that keeps
each key's line for error messages (``yamlfile.py``), ``${name}`` substitution
(``template.py``), the project file ``outrig.yaml`` (``project_file.py``), ``hf:`` sources
(``hub_source.py``) and the ``environments:`` schema (``environments.py``). Each imports
nothing of outrig but its errors."""
