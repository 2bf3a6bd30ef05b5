// The paged KV cache as attention.comp and rope_store_kv.comp see it. Each layer's K (and V)
// pool holds rows of n_head_kv * head_dim values; a sequence's positions map to rows through its
// row of the block table: position pos of the sequence in slot s sits in row
// block_table[s * table_stride + pos / KV_BLOCK] * KV_BLOCK + pos % KV_BLOCK.
// Values are f16, or with KV_Q8 int8 in q8_0-like blocks of 32 values (a row's values in one
// buffer, one f16 scale per block in another: value = q * scale). The includer defines
// KV_TABLE_BINDING before including this.
layout(constant_id = 5) const uint KV_BLOCK = 16;
const uint KV_Q8_GROUP = 32;   // values per q8_0 scale

#if defined(KV_Q8)
#define KV_VEC4 i8vec4
#define KV_SCALAR int8_t
#else
#define KV_VEC4 f16vec4
#define KV_SCALAR float16_t
#endif

layout(std430, binding = KV_TABLE_BINDING) readonly buffer Table { uint block_table[]; };

uint kv_row(uint slot, uint pos, uint table_stride) {
    return block_table[slot * table_stride + pos / KV_BLOCK] * KV_BLOCK + pos % KV_BLOCK;
}
