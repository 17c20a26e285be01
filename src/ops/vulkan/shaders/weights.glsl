// Reading one element of a weight matrix in its stored row-major layout (ops/weight.h, kRowMajor),
// included by the GEMM shaders. WTYPE (specialization constant 0): 0 f32, 1 f16, 2 bf16, 3 q8, 4 q4.
//   q8: int8 codes [rows, cols], f32 scales [rows]:              w = scale[r] * q
//   q4: 4-bit codes [rows, cols/2] (even column in the low nibble), f16 scales and mins
//       [rows, cols/group_size]:                                  w = scale[r, g] * q + min[r, g]
// Needs the buffers w (binding 1), scales (2), mins (3) and the push constants cols and group_size.

// 16-bit element e of a uint array as the raw half word.
uint half_word(uint word, uint e) { return (word >> ((e & 1u) * 16u)) & 0xffffu; }

float weight_at(uint r, uint c) {
  if (WTYPE == 0) return uintBitsToFloat(w[r * p.cols + c]);
  if (WTYPE == 1) {
    const uint e = r * p.cols + c;
    return unpackHalf2x16(half_word(w[e >> 1], e)).x;
  }
  if (WTYPE == 2) {
    const uint e = r * p.cols + c;
    return uintBitsToFloat(half_word(w[e >> 1], e) << 16);
  }
  if (WTYPE == 3) {
    const uint e = r * p.cols + c;
    const int q = int(w[e >> 2] << (24u - 8u * (e & 3u))) >> 24;  // sign-extended byte
    return uintBitsToFloat(scales[r]) * float(q);
  }
  const uint e = r * (p.cols / 2u) + c / 2u;
  const uint byte = (w[e >> 2] >> (8u * (e & 3u))) & 0xffu;
  const uint q = (c & 1u) != 0u ? byte >> 4 : byte & 15u;
  const uint g = r * (p.cols / p.group_size) + c / p.group_size;
  return unpackHalf2x16(half_word(scales[g >> 1], g)).x * float(q) + unpackHalf2x16(half_word(mins[g >> 1], g)).x;
}
