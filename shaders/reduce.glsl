// Workgroup reductions: subgroup operations inside a subgroup, shared memory across subgroups.
// Every invocation of the workgroup must call them (uniform control flow); all get the result.
// Workgroups have at most 64 subgroups (the host keeps workgroup size / subgroup size <= 64).
const uint REDUCE_MAX_SUBGROUPS = 64;
#define NEG_INF uintBitsToFloat(0xFF800000u)
shared float reduce_value[REDUCE_MAX_SUBGROUPS];
shared uint reduce_index[REDUCE_MAX_SUBGROUPS];

float workgroup_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) {
        reduce_value[gl_SubgroupID] = v;
    }
    barrier();
    float total = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        total += reduce_value[i];
    }
    barrier();
    return total;
}

float workgroup_max(float v) {
    v = subgroupMax(v);
    if (subgroupElect()) {
        reduce_value[gl_SubgroupID] = v;
    }
    barrier();
    float m = reduce_value[0];
    for (uint i = 1; i < gl_NumSubgroups; i++) {
        m = max(m, reduce_value[i]);
    }
    barrier();
    return m;
}

// The best (value, index) pair: the largest value, the smallest index among equal values.
// Invocations with nothing to offer pass (-inf, 0xFFFFFFFF).
void workgroup_best(inout float v, inout uint index) {
    const float m = subgroupMax(v);
    const uint i = subgroupMin(v == m ? index : 0xFFFFFFFFu);
    if (subgroupElect()) {
        reduce_value[gl_SubgroupID] = m;
        reduce_index[gl_SubgroupID] = i;
    }
    barrier();
    v = reduce_value[0];
    index = reduce_index[0];
    for (uint s = 1; s < gl_NumSubgroups; s++) {
        const float vs = reduce_value[s];
        const uint is = reduce_index[s];
        if (vs > v || (vs == v && is < index)) {
            v = vs;
            index = is;
        }
    }
    barrier();
}
