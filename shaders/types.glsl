// GGUF weight types (block layouts exactly as ggml-common.h). A variant defines DATA_A_<TYPE>;
// this header then names the block struct A_TYPE and its values per block QUANT_K.
// Each struct views its block's bytes through the widest words the block's alignment allows
// (a Q4_0 block is 18 bytes: 16-bit words; Q4_K 144 bytes: 16-byte vectors), and kernels read
// weights through this one view only: mixing views of one binding made NVIDIA's code slow.
// Float types have QUANT_K 1: a "block" is one value and rows may have any length; A_TYPE is a
// 4-vector of them (weight buffers are padded to 16 bytes).

#if !defined(TYPES_GLSL)
#define TYPES_GLSL

#if defined(DATA_A_F32)
#define QUANT_K 1
#define A_TYPE vec4

#elif defined(DATA_A_F16)
#define QUANT_K 1
#define A_TYPE f16vec4

#elif defined(DATA_A_BF16)
#define QUANT_K 1
#define A_TYPE u16vec4

#elif defined(DATA_A_Q4_0)
#define QUANT_K 32
struct block_q4_0 { float16_t d; uint16_t qs[8]; };
#define A_TYPE block_q4_0

#elif defined(DATA_A_Q4_1)
#define QUANT_K 32
struct block_q4_1 { f16vec2 dm; uint32_t qs[4]; };
#define A_TYPE block_q4_1

#elif defined(DATA_A_Q5_0)
#define QUANT_K 32
struct block_q5_0 { float16_t d; uint16_t qh[2]; uint16_t qs[8]; };
#define A_TYPE block_q5_0

#elif defined(DATA_A_Q5_1)
#define QUANT_K 32
struct block_q5_1 { f16vec2 dm; uint32_t qh; uvec2 qs[2]; };
#define A_TYPE block_q5_1

#elif defined(DATA_A_Q8_0)
#define QUANT_K 32
struct block_q8_0 { float16_t d; uint16_t qs[16]; };
#define A_TYPE block_q8_0

#elif defined(DATA_A_MXFP4)
#define QUANT_K 32
struct block_mxfp4 { uint8_t e; uint8_t qs[16]; };
#define A_TYPE block_mxfp4

#elif defined(DATA_A_Q2_K)
#define QUANT_K 256
struct block_q2_k { uint32_t scales[4]; uint32_t qs[16]; f16vec2 dm; };
#define A_TYPE block_q2_k

#elif defined(DATA_A_Q3_K)
#define QUANT_K 256
struct block_q3_k { uint16_t hmask[16]; uint16_t qs[32]; uint16_t scales[6]; float16_t d; };
#define A_TYPE block_q3_k

#elif defined(DATA_A_Q4_K)
#define QUANT_K 256
struct block_q4_k { f16vec2 dm; uint32_t scales[3]; uvec4 qs[8]; };
#define A_TYPE block_q4_k

#elif defined(DATA_A_Q5_K)
#define QUANT_K 256
struct block_q5_k { f16vec2 dm; uint32_t scales[3]; uvec4 qh[2]; uvec4 qs[8]; };
#define A_TYPE block_q5_k

#elif defined(DATA_A_Q6_K)
#define QUANT_K 256
struct block_q6_k { uint16_t ql[64]; uint16_t qh[32]; uint16_t scales[8]; float16_t d; };
#define A_TYPE block_q6_k

#else
#error "define one DATA_A_<TYPE>"
#endif
#endif
