"""GPU parts shared by several ops: the top-k engine (``topk``), the CuTe DSL compile helper
(``compile``), small CuTe DSL helpers (``cute``), Triton's cache built ahead of time
(``triton_cache``) and the switch of programmatic dependent launch (``pdl``). Each op's own
kernel is in its folder under ``ops/``."""
