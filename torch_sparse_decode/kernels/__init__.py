"""GPU parts shared by several ops: the top-k engine (``topk``), the CuTe DSL compile helper
(``compile``), small CuTe DSL helpers (``cute``) and Triton's cache built ahead of time
(``triton_cache``). Each op's own kernel is in its folder under
``ops/``."""
