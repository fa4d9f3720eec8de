"""``outrig evaluate``'s pure part, on the workstation (the op that calls the box is
:mod:`outrig.ops.evaluate`): the playbook's ``evaluate:`` key (:mod:`.section`), what one
evaluation serves, sends and found, with vLLM's counters (:mod:`.spec`); the figures beyond the
counters: latency percentiles, per-request and per-category acceptance (:mod:`.figures`), the
cached baseline's key (:mod:`.baseline`), provenance and the named causes of a bad number
(:mod:`.causes`), the model-card section (:mod:`.card`), the document and report parts
(:mod:`.document`, :mod:`.report`), the served points of a run (:mod:`.served`), and the
default smoke prompt set (``prompts/smoke.jsonl``)."""
