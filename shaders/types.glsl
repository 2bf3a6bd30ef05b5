// GGUF weight types (block layouts exactly as ggml-common.h). A variant defines DATA_A_<TYPE>;
// this header then names the block struct A_TYPE, its values per block QUANT_K, and where the
// block size allows it, views of the same bytes as 16-bit (A_TYPE_PACKED16) or 32-bit words
// (A_TYPE_PACKED32) so that dequantize reads words instead of single bytes.
// Float types have QUANT_K 1: a "block" is one value and rows may have any length.

#if defined(DATA_A_F32)
#define QUANT_K 1
#define A_TYPE float

#elif defined(DATA_A_F16)
#define QUANT_K 1
#define A_TYPE float16_t

#elif defined(DATA_A_BF16)
#define QUANT_K 1
#define A_TYPE uint16_t

#elif defined(DATA_A_Q4_0)
#define QUANT_K 32
struct block_q4_0 { float16_t d; uint8_t qs[16]; };
struct block_q4_0_packed16 { float16_t d; uint16_t qs[8]; };
#define A_TYPE block_q4_0
#define A_TYPE_PACKED16 block_q4_0_packed16

#elif defined(DATA_A_Q4_1)
#define QUANT_K 32
struct block_q4_1 { float16_t d; float16_t m; uint8_t qs[16]; };
struct block_q4_1_packed32 { f16vec2 dm; uint32_t qs[4]; };
#define A_TYPE block_q4_1
#define A_TYPE_PACKED32 block_q4_1_packed32

#elif defined(DATA_A_Q5_0)
#define QUANT_K 32
struct block_q5_0 { float16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct block_q5_0_packed16 { float16_t d; uint16_t qh[2]; uint16_t qs[8]; };
#define A_TYPE block_q5_0
#define A_TYPE_PACKED16 block_q5_0_packed16

#elif defined(DATA_A_Q5_1)
#define QUANT_K 32
struct block_q5_1 { float16_t d; float16_t m; uint8_t qh[4]; uint8_t qs[16]; };
struct block_q5_1_packed32 { f16vec2 dm; uint32_t qh; uint32_t qs[4]; };
#define A_TYPE block_q5_1
#define A_TYPE_PACKED32 block_q5_1_packed32

#elif defined(DATA_A_Q8_0)
#define QUANT_K 32
struct block_q8_0 { float16_t d; int8_t qs[32]; };
struct block_q8_0_packed16 { float16_t d; uint16_t qs[16]; };
#define A_TYPE block_q8_0
#define A_TYPE_PACKED16 block_q8_0_packed16

#elif defined(DATA_A_MXFP4)
#define QUANT_K 32
struct block_mxfp4 { uint8_t e; uint8_t qs[16]; };
#define A_TYPE block_mxfp4

#elif defined(DATA_A_Q2_K)
#define QUANT_K 256
struct block_q2_k { uint8_t scales[16]; uint8_t qs[64]; f16vec2 dm; };
struct block_q2_k_packed32 { uint32_t scales[4]; uint32_t qs[16]; f16vec2 dm; };
#define A_TYPE block_q2_k
#define A_TYPE_PACKED32 block_q2_k_packed32

#elif defined(DATA_A_Q3_K)
#define QUANT_K 256
struct block_q3_k { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; float16_t d; };
struct block_q3_k_packed16 { uint16_t hmask[16]; uint16_t qs[32]; uint16_t scales[6]; float16_t d; };
#define A_TYPE block_q3_k
#define A_TYPE_PACKED16 block_q3_k_packed16

#elif defined(DATA_A_Q4_K)
#define QUANT_K 256
struct block_q4_k { f16vec2 dm; uint8_t scales[12]; uint8_t qs[128]; };
struct block_q4_k_packed32 { f16vec2 dm; uint32_t scales[3]; uint32_t qs[32]; };
#define A_TYPE block_q4_k
#define A_TYPE_PACKED32 block_q4_k_packed32

#elif defined(DATA_A_Q5_K)
#define QUANT_K 256
struct block_q5_k { f16vec2 dm; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct block_q5_k_packed32 { f16vec2 dm; uint32_t scales[3]; uint32_t qh[8]; uint32_t qs[32]; };
#define A_TYPE block_q5_k
#define A_TYPE_PACKED32 block_q5_k_packed32

#elif defined(DATA_A_Q6_K)
#define QUANT_K 256
struct block_q6_k { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; float16_t d; };
struct block_q6_k_packed16 { uint16_t ql[64]; uint16_t qh[32]; uint16_t scales[8]; float16_t d; };
#define A_TYPE block_q6_k
#define A_TYPE_PACKED16 block_q6_k_packed16

#else
#error "define one DATA_A_<TYPE>"
#endif
