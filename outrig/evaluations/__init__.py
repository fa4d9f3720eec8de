"""``outrig evaluate``'s pure figures beyond the counters: latency percentiles, per-request
and per-category acceptance (:mod:`.figures`), the cached baseline's key (:mod:`.baseline`),
provenance and the named causes of a bad number (:mod:`.causes`), the model-card section
(:mod:`.card`), and the default smoke prompt set (``prompts/smoke.jsonl``)."""
