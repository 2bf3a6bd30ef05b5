// Workgroup reductions: subgroup operations inside a subgroup, shared memory across subgroups.
// Every invocation of the workgroup must call them (uniform control flow); all get the result.
// Workgroups have at most 64 subgroups (the host keeps workgroup size / subgroup size <= 64).
// Two sets of shared slots alternate between calls, so one barrier per call suffices: a call
// writes the set that the previous call did not, and the one before it was read by everyone
// before they reached the previous call's barrier.
const uint REDUCE_MAX_SUBGROUPS = 64;
#define NEG_INF uintBitsToFloat(0xFF800000u)
shared float reduce_value[2][REDUCE_MAX_SUBGROUPS];
shared uint reduce_index[2][REDUCE_MAX_SUBGROUPS];
uint reduce_set = 0;

float workgroup_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) {
        reduce_value[reduce_set][gl_SubgroupID] = v;
    }
    barrier();
    float total = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        total += reduce_value[reduce_set][i];
    }
    reduce_set ^= 1;
    return total;
}

// The best (value, index) pair: the largest value, the smallest index among equal values.
// Invocations with nothing to offer pass (-inf, 0xFFFFFFFF).
void workgroup_best(inout float v, inout uint index) {
    const float m = subgroupMax(v);
    const uint i = subgroupMin(v == m ? index : 0xFFFFFFFFu);
    if (subgroupElect()) {
        reduce_value[reduce_set][gl_SubgroupID] = m;
        reduce_index[reduce_set][gl_SubgroupID] = i;
    }
    barrier();
    v = reduce_value[reduce_set][0];
    index = reduce_index[reduce_set][0];
    for (uint s = 1; s < gl_NumSubgroups; s++) {
        const float vs = reduce_value[reduce_set][s];
        const uint is = reduce_index[reduce_set][s];
        if (vs > v || (vs == v && is < index)) {
            v = vs;
            index = is;
        }
    }
    reduce_set ^= 1;
}
