"""The exact top-k engine behind ``select_candidate_blocks``, ``indexer_topk`` (and their fused
forms) and the DCP pack's local select (CuTe DSL).

The engine (``RadixTopk``, CuTe DSL) writes the ids of the best ``k_sel`` of each row's first
``n`` keys, ascending, -1 padded, optionally followed by a pinned id (the newest block).

- Keys are 32-bit, unsigned order = library order (NaN as -inf, -0.0 as +0.0); ids break ties.
  A row is split over a thread-block cluster of S CTAs (S = 1..8 by row width and row count),
  each owning a contiguous span of the row's valid prefix (work follows the valid length).
- The k_sel-th largest key t is found one radix digit at a time (11, 11 and 10 bits): every CTA
  histograms its span's keys that match the digits found so far (shared-memory atomics), and the
  digit is read off the cluster's summed histogram through distributed shared memory, in two
  rounds of few remote loads (512 coarse bins, then the chosen one's fine bins). Every CTA also
  learns how many of its own keys are above t and equal to t.
- A span streams through a shared-memory ring of STAGES tiles (16-byte cp.async, any row
  alignment, nothing read past the valid prefix); each warp copies and reads only its own
  contiguous part of every tile, so the pipeline needs warp syncs, not CTA barriers. A span of
  <= STAGES tiles stays resident: later passes read shared memory, not the row.
- Spans of more than ONE_READ_FROM keys (two tiles) take one read: the first pass copies each
  key above a gate, guessed from the CTA's first tile to leave about twice its share of the best
  k_sel above it, with no CTA barrier (warps claim room; the parts are put in index order after
  the pass), and counts the keys equal to the gate; the digits are read off the copies and
  those counts alone. Where tile 0's chosen first-digit bin holds most of the tile (narrow rows
  such as 1 + 1e-6 randn, tie-heavy rows), the gate is the tile's exact key of that rank, not a
  line through the bin: on rows of one or few values and ReLU zeros that is the tied value, so
  the copy stays small and a CTA whose gate is t streams its span again only until its share
  of the ties (the lowest ids) is out. The answer is exact when every CTA's gate is <= t, which
  is checked. Where it fails (rising, falling or trending rows, whose first tile is not like the
  rest), the CTAs whose copies lack keys >= t copy again with a gate guessed from a sample of
  their whole span, checked the same way; if that fails too (and for shorter spans), two
  passes: after the first digit a CTA whose
  keys at or above t's bucket fit in shared memory copies them there in index order (one CTA
  barrier per tile); tie-heavy spans, whose bucket holds most of the span, pass over it once
  per digit instead (still exact), copying the keys above the bucket on the way. The second
  digit's pass also ANDs and ORs the bucket's keys: where they agree over the cluster the
  bucket is one value, which is t, and the third pass is skipped.
- A row of <= k_sel keys keeps them all: the engine writes every valid id in order and the
  padding without reading a key (and the block-key pre-pass skips such rows).
- Output: each CTA writes its keys > t and its share of the keys == t at an offset from the
  counts of the CTAs before it. Ties at t go to the lowest ids, so ids come out ascending with no
  sort and no approximate bin; nothing is written outside ``out`` (no workspace). A CTA that
  re-streams its span for the output stops once its share is out (on tie-heavy rows the lowest
  ids fill it in the first tiles), or, with a copy of its keys above t, once its ties are out.

Why CuTe DSL: the select needs shared-memory atomics, warp votes, cluster barriers and
distributed shared memory, none of which Triton exposes. docs/topk_engine.md says where the time
goes and which attempts did not pay.

Modules, by concern: ``keys`` (the key encoding and the radix digits), ``layout`` (sizes, and the
table of the CTA's shared memory), ``cluster`` (warp and cluster primitives), ``stream`` (the
tile ring), ``digits`` (the digit search and the two-pass copy), ``one_read`` (the gated copy),
``output`` (writing the ids and the fused outputs), ``engine`` (the kernel, as a sequence of
phases, and its catalog of builds), ``launch`` (the cluster size, which batches take the
short-row path, and the ops' call) and ``short_row`` (the one-CTA select of rows of at most
16K keys; ``TORCH_SPARSE_DECODE_SHORT_ROWS=0`` turns it off).
"""

from .engine import RadixTopk, catalog, compiled
from .launch import cluster_size, select, select_ord16, sm_count
from .layout import (BINS, CAP, CLUSTER_SIZES, FINE, ID_BITS, MAX_CLUSTER, MAX_TILES, ONE_READ_FROM, PER, PHASES,
                     PROFILE_SLOTS, SOURCES, SPAN_PER_CTA, STAGES, THREADS, TILE, WARP_SPAN, WARPS, smem_bytes)

__all__ = [
    "RadixTopk", "catalog", "compiled", "cluster_size", "select", "select_ord16", "sm_count", "smem_bytes",
    "BINS", "CAP", "CLUSTER_SIZES", "FINE", "ID_BITS", "MAX_CLUSTER", "MAX_TILES", "ONE_READ_FROM", "PER", "PHASES",
    "PROFILE_SLOTS", "SOURCES", "SPAN_PER_CTA", "STAGES", "THREADS", "TILE", "WARP_SPAN", "WARPS",
]
