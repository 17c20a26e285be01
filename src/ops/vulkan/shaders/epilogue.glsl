// The GEMMs' epilogue (matmul, matvec, matmul_coop, split_reduce: the including shader declares the
// buffer aux[] and the push constant p.epilogue): what y[e] gets for the product v (its bias added), so
// that a pass that would only move bytes is not one of its own — 0: v; 1: aux[e] + v (the residual add
// into h, aux = y); 2: silu(aux[e]) · v (SwiGLU, aux the gate), computed as elementwise.comp computes
// them. aux may alias y: each element is read by the invocation that writes it, before it does.
float epilogue(uint e, float v) {
  if (p.epilogue == 1u) return aux[e] + v;
  if (p.epilogue == 2u) {
    const float g = aux[e];
    return g / (1.0 + exp(-g)) * v;
  }
  return v;
}
