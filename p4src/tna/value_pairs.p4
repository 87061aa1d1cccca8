// lhc-ina on TNA: the value lanes' code, one register pair of lanes A and A + 1 at a time, as macros that
// LhcIngress (ingress.p4) expands once per pair through the generated X-macros (../shared/constants.p4).
// A register pair of value lanes A and B = A + 1, its four RegisterActions and the table that picks one.
// The update returns the new low half; `hi` reads the high half in a later pass. A retransmission reads
// the low halves by OR-ing zeros, so four RegisterActions suffice.
#define LHC_TNA_PAIR(A, B)                                                                        \
    Register<pair_t, cell_index_t>(LHC_SLOT_CELLS) values_##A##_##B;                              \
    RegisterAction<pair_t, cell_index_t, bit<32>>(values_##A##_##B) first_##A##_##B = {           \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            v.lo = hdr.payload.w##A;                                                              \
            v.hi = hdr.payload.w##B;                                                              \
            rv = v.lo;                                                                            \
        }                                                                                         \
    };                                                                                            \
    RegisterAction<pair_t, cell_index_t, bit<32>>(values_##A##_##B) add_##A##_##B = {             \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            v.lo = v.lo + hdr.payload.w##A;                                                       \
            v.hi = v.hi + hdr.payload.w##B;                                                       \
            rv = v.lo;                                                                            \
        }                                                                                         \
    };                                                                                            \
    RegisterAction<pair_t, cell_index_t, bit<32>>(values_##A##_##B) or_##A##_##B = {              \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            v.lo = v.lo | hdr.payload.w##A;                                                       \
            v.hi = v.hi | hdr.payload.w##B;                                                       \
            rv = v.lo;                                                                            \
        }                                                                                         \
    };                                                                                            \
    RegisterAction<pair_t, cell_index_t, bit<32>>(values_##A##_##B) hi_##A##_##B = {              \
        void apply(inout pair_t v, out bit<32> rv) {                                              \
            rv = v.hi;                                                                            \
        }                                                                                         \
    };                                                                                            \
    action do_first_##A##_##B() { hdr.payload.w##A = first_##A##_##B.execute(meta.cell); }        \
    action do_add_##A##_##B() { hdr.payload.w##A = add_##A##_##B.execute(meta.cell); }            \
    action do_or_##A##_##B() { hdr.payload.w##A = or_##A##_##B.execute(meta.cell); }              \
    action do_hi_##A##_##B() { hdr.payload.w##B = hi_##A##_##B.execute(meta.cell); }              \
    table update_##A##_##B {                                                                      \
        key = {                                                                                   \
            meta.vmode: ternary;                                                                  \
            meta.seen: ternary;                                                                   \
            hdr.lhc.op: ternary;                                                                  \
        }                                                                                         \
        actions = { do_first_##A##_##B; do_add_##A##_##B; do_or_##A##_##B; do_hi_##A##_##B;       \
                    @defaultonly NoAction; }                                                      \
        const default_action = NoAction();                                                        \
        size = 8;                                                                                 \
        const entries = {                                                                         \
            (LHC_VMODE_START, _, _): do_first_##A##_##B();                                        \
            (LHC_VMODE_SAME, 0, LHC_OP_ADD): do_add_##A##_##B();                                  \
            (LHC_VMODE_SAME, 0, LHC_OP_OR): do_or_##A##_##B();                                    \
            (LHC_VMODE_OR, _, _): do_or_##A##_##B();                                              \
            (LHC_VMODE_HI, _, _): do_hi_##A##_##B();                                              \
        }                                                                                         \
    }
#define LHC_TNA_PAIR_APPLY(A, B) update_##A##_##B.apply();
#define LHC_TNA_ZERO_LANE(L) hdr.payload.w##L = 0;
