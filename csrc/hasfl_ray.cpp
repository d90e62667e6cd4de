// The hasfl_ray operator library: schemas here, kernels in cpu/ and cuda/ (picked by the dispatcher).
#include <Python.h>
#include <torch/library.h>

// `import hasfl_ray._C` loads this shared library, which registers the ops below as a side effect;
// the module itself is empty (the ops are called through torch.ops.hasfl_ray).
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "hasfl_ray operator library", -1, nullptr};
  return PyModule_Create(&module_def);
}

TORCH_LIBRARY(hasfl_ray, m) {
  // Fused gather + coordinate-wise weighted mean + per-client divergence norms of packed updates.
  // out: flat global output (float32/float64), written in full; packed: one contiguous tensor per row of
  // `entries`; params/entries: the int64 CPU layout tables of csrc/aggregate_layout.h; weights: float64
  // CPU, one per client. Returns (div_num, div_den) float64 (num_clients,) and the number of covered
  // coordinates (int64 scalar), on out's device.
  m.def("aggregate_into(Tensor(a!) out, Tensor[] packed, Tensor params, Tensor entries, Tensor weights) -> "
        "(Tensor, Tensor, Tensor)");
  // The same with parameters whose clients hold index sets or masks (csrc/aggregate_sparse_host.h): kinds
  // (P) int64, 0 dense / 1 sparse; bits: one uint8 column bitmask per entry; rows/row_offsets: the row dims'
  // sorted index lists. Slices and windows keep aggregate_into.
  m.def("aggregate_sparse_into(Tensor(a!) out, Tensor[] packed, Tensor params, Tensor entries, Tensor weights, "
        "Tensor kinds, Tensor[] bits, Tensor rows, Tensor row_offsets) -> (Tensor, Tensor, Tensor)");
}
