// GELU in its tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the form
// llama.cpp's ggml_gelu and Gemma use. The tanh argument is clamped: past |15| tanh is +-1 in
// f32, and some drivers' tanh overflows to NaN for large arguments.
float gelu(float x) {
    const float u = 0.7978845608028654 * x * (1.0 + 0.044715 * x * x);
    return 0.5 * x * (1.0 + tanh(clamp(u, -15.0, 15.0)));
}
