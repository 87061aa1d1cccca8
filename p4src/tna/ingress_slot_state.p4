// Part of control LhcIngress (ingress.p4), included inside its body: the registers of slot state (each
// copy's round, twice, and its bitmap) and their RegisterActions. hdr, meta and ig_* are the control's
// parameters.
    // --- slot state ---------------------------------------------------------------------------------
    // Branch order matters below: bf-p4c 9.13.4 decides whether `rv = v.lo` outputs the stored value
    // (mem_lo) or the updated one (alu_lo) by whether *any* earlier statement, even in the other branch
    // of an if, wrote v.lo. So a branch that returns a stored half comes before any write of that half.
    //
    // The round of each copy, {lo: seq, hi: epoch}, indexed by slot_base + slot; two registers hold the
    // same value, each answering one question. Both record the packet's seq unless it is older than the
    // copy's round (equal: no change; newer or a fresh copy: the packet starts that round). Comparisons are
    // unsigned: hosts never let seq wrap within an epoch (docs/protocol.md). Where v1model starts only the
    // round 2 * slot_count after a finished one, this starts any newer round: for hosts that keep the
    // window rule these are the same packets (docs/switch.md, "Round identity"; docs/tofino.md).
#define LHC_TNA_ROUND_REGISTERS(C)                                                                \
    Register<pair_t, bit<16>>(LHC_MAX_SLOTS) round_stale_##C;                                     \
    Register<pair_t, bit<16>>(LHC_MAX_SLOTS) round_start_##C;                                     \
    /* Nonzero (the epoch) when the packet's round is older than the copy's: it is dropped. */    \
    RegisterAction<pair_t, bit<16>, bit<32>>(round_stale_##C) round_stale_##C##_check = {         \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            if (v.hi == meta.epoch && hdr.lhc.seq < v.lo) {                                       \
                rv = v.hi;                                                                        \
            } else {                                                                              \
                rv = 0;                                                                           \
                v.lo = hdr.lhc.seq;                                                               \
                v.hi = meta.epoch;                                                                \
            }                                                                                     \
        }                                                                                         \
    };                                                                                            \
    /* Nonzero (the epoch) when the packet starts the copy's round: a fresh copy or a newer one. */ \
    RegisterAction<pair_t, bit<16>, bit<32>>(round_start_##C) round_start_##C##_check = {         \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            if (v.hi != meta.epoch || hdr.lhc.seq > v.lo) {                                       \
                v.lo = hdr.lhc.seq;                                                               \
                v.hi = meta.epoch;                                                                \
                rv = v.hi;                                                                        \
            } else {                                                                              \
                rv = 0;                                                                           \
            }                                                                                     \
        }                                                                                         \
    };                                                                                            \
    /* A parent's result: nonzero unless it is of the copy's round (it is then stale). Writes     \
       nothing. Its output goes where round_stale's does (one output field per stateful ALU). */  \
    RegisterAction<pair_t, bit<16>, bit<32>>(round_stale_##C) round_other_##C##_check = {         \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            if (v.hi == meta.epoch && hdr.lhc.seq == v.lo) {                                      \
                rv = 0;                                                                           \
            } else {                                                                              \
                rv = 1;                                                                           \
            }                                                                                     \
        }                                                                                         \
    };
    LHC_TNA_ROUND_REGISTERS(c0)
    LHC_TNA_ROUND_REGISTERS(c1)

    // Per cell, {lo: the contributors of the copy's round, hi: where the copy stands (LHC_COPY_*)}. The
    // first of a round sets its bit alone; a later packet of the round ORs its bit in and gets the bitmap
    // as found (its bit set: a repeat). On a leaf lo stays its workers' contributors after the partial went
    // up, so a worker's repeat of a final copy is seen as one; the state says whether the copy awaits its
    // parent or holds its result. A leaf marks its copy awaiting in the pass that sends the partial up (the
    // first pass cannot: it learns that the leaf's round is complete only in `full_round`, after this
    // stage), and its parent's result is stored only by a marked copy, which it makes final.
    Register<pair_t, cell_index_t>(LHC_SLOT_CELLS) bitmaps;
    RegisterAction<pair_t, cell_index_t, bit<32>>(bitmaps) bitmap_start = {
        void apply(inout pair_t v) {
            v.lo = meta.worker_bit;
            v.hi = LHC_COPY_AGGREGATING;
        }
    };
    RegisterAction<pair_t, cell_index_t, bit<32>>(bitmaps) bitmap_join = {
        void apply(inout pair_t v, out bit<32> rv) {
            rv = v.lo;
            v.lo = v.lo | meta.worker_bit;
        }
    };
    // The partial (its bitmap the leaf's workers') goes up: the copy awaits its parent, unless its parent's
    // result was stored meanwhile (a repeat's partial can still be in its later passes then) or the copy
    // moved on to another round.
    RegisterAction<pair_t, cell_index_t, bit<32>>(bitmaps) bitmap_await = {
        void apply(inout pair_t v) {
            if (v.hi == LHC_COPY_AGGREGATING && v.lo == hdr.lhc.bitmap) {
                v.hi = LHC_AWAITING_PARENT;
            }
        }
    };
    // The parent's result of the copy's round: the state as found; a copy that awaited it is now final.
    RegisterAction<pair_t, cell_index_t, bit<32>>(bitmaps) bitmap_store = {
        void apply(inout pair_t v, out bit<32> rv) {
            rv = v.hi;
            if (v.hi == LHC_AWAITING_PARENT) {
                v.hi = LHC_COPY_FINAL;
            }
        }
    };

    // Per cell, the bitmap of the parent's result a leaf's copy stored (what its RESULT_RETX carry), 0 while
    // it holds none: a worker's repeat reads it to tell a final copy from one awaiting its parent. It is
    // read (or cleared, by the first of a round) in the stage after `bitmaps`, because a parent's result is
    // written here only when `bitmap_store` found the copy awaiting.
    Register<bit<32>, cell_index_t>(LHC_SLOT_CELLS) parent_bitmaps;
    RegisterAction<bit<32>, cell_index_t, bit<32>>(parent_bitmaps) parent_bitmap_clear = {
        void apply(inout bit<32> v) {
            v = 0;
        }
    };
    RegisterAction<bit<32>, cell_index_t, bit<32>>(parent_bitmaps) parent_bitmap_read = {
        void apply(inout bit<32> v, out bit<32> rv) {
            rv = v;
        }
    };
    RegisterAction<bit<32>, cell_index_t, bit<32>>(parent_bitmaps) parent_bitmap_store = {
        void apply(inout bit<32> v) {
            v = hdr.lhc.bitmap;
        }
    };
