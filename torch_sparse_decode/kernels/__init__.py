"""GPU parts shared by several ops: the top-k engine (``topk``), the CuTe DSL compile helper
(``compile``) and small CuTe DSL helpers (``cute``). Each op's own kernel is in its folder under
``ops/``."""
