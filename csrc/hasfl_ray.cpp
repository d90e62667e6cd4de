// The hasfl_ray operator library: schemas here, kernels in cpu/ and cuda/ (picked by the dispatcher).
#include <Python.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <exception>
#include <string>
#include <tuple>
#include <vector>

namespace {

using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// The ops' direct entries (hasfl_ray._C.aggregate_into / aggregate_sparse_into): the same ops through the same
// dispatcher, minus torch.ops' boxing of every argument. Handing torch.ops one tensor per (client, parameter)
// costs 160-210 ns a tensor on the sandbox's CPU (1,400 at 50 EMNIST clients: 0.23 ms; 5,600 at 200: 1.2 ms), as
// much as the CUDA kernel itself at 50 clients; here a list is read in place (benchmarks/bench_handover.py).
// Eager calls only: hasfl_ray/ops takes torch.ops under torch.compile, which traces it.

// obj as a tensor (`what` names it in the TypeError otherwise).
bool tensor_of(PyObject* obj, const char* what, at::Tensor* out) {
  if (!THPVariable_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s is a %s; expected a torch.Tensor", what, Py_TYPE(obj)->tp_name);
    return false;
  }
  *out = THPVariable_Unpack(obj);
  return true;
}

// Every item of a list or tuple of tensors.
bool tensors_of(PyObject* sequence, const char* what, std::vector<at::Tensor>* out) {
  PyObject* fast = PySequence_Fast(sequence, "expected a list or tuple of tensors");
  if (fast == nullptr) return false;
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  out->reserve(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (!THPVariable_Check(items[i])) {
      PyErr_Format(PyExc_TypeError, "%s[%zd] is a %s; expected a torch.Tensor", what, i, Py_TYPE(items[i])->tp_name);
      Py_DECREF(fast);
      return false;
    }
    out->push_back(THPVariable_Unpack(items[i]));
  }
  Py_DECREF(fast);
  return true;
}

// The op's result as a tuple of three tensors.
PyObject* wrap(const Result& result) {
  PyObject* a = THPVariable_Wrap(std::get<0>(result));
  PyObject* b = a ? THPVariable_Wrap(std::get<1>(result)) : nullptr;
  PyObject* c = b ? THPVariable_Wrap(std::get<2>(result)) : nullptr;
  if (c == nullptr) {
    Py_XDECREF(a);
    Py_XDECREF(b);
    return nullptr;
  }
  PyObject* tuple = PyTuple_Pack(3, a, b, c);
  Py_DECREF(a);
  Py_DECREF(b);
  Py_DECREF(c);
  return tuple;
}

// Runs `call` without the GIL (the CPU kernel runs OpenMP threads; a CUDA call waits on the device), and turns a
// C++ exception into the Python exception torch.ops raises for it.
template <typename Call>
PyObject* run_released(Call&& call) {
  Result result;
  bool failed = true;
  PyObject* kind = PyExc_RuntimeError;
  std::string text;
  PyThreadState* state = PyEval_SaveThread();
  try {
    result = call();
    failed = false;
  } catch (const c10::TypeError& error) {
    kind = PyExc_TypeError;
    text = error.what_without_backtrace();
  } catch (const c10::ValueError& error) {
    kind = PyExc_ValueError;
    text = error.what_without_backtrace();
  } catch (const c10::IndexError& error) {
    kind = PyExc_IndexError;
    text = error.what_without_backtrace();
  } catch (const c10::Error& error) {
    text = error.what_without_backtrace();
  } catch (const std::exception& error) {
    text = error.what();
  } catch (...) {
    text = "the op failed with a C++ exception that is not a std::exception";
  }
  PyEval_RestoreThread(state);
  if (failed) {
    PyErr_SetString(kind, text.c_str());
    return nullptr;
  }
  return wrap(result);
}

PyObject* aggregate_into_direct(PyObject*, PyObject* args) {
  PyObject *out_o, *packed_o, *params_o, *entries_o, *weights_o;
  if (!PyArg_ParseTuple(args, "OOOOO:aggregate_into", &out_o, &packed_o, &params_o, &entries_o, &weights_o))
    return nullptr;
  at::Tensor out, params, entries, weights;
  std::vector<at::Tensor> packed;
  if (!tensor_of(out_o, "out", &out) || !tensors_of(packed_o, "packed", &packed) ||
      !tensor_of(params_o, "params", &params) || !tensor_of(entries_o, "entries", &entries) ||
      !tensor_of(weights_o, "weights", &weights))
    return nullptr;
  return run_released([&] {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("hasfl_ray::aggregate_into", "")
            .typed<Result(const at::Tensor&, at::TensorList, const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
    const at::AutoDispatchBelowADInplaceOrView below;  // see run_released
    return op.call(out, packed, params, entries, weights);
  });
}

PyObject* aggregate_sparse_into_direct(PyObject*, PyObject* args) {
  PyObject *out_o, *packed_o, *params_o, *entries_o, *weights_o, *kinds_o, *bits_o, *rows_o, *offsets_o;
  if (!PyArg_ParseTuple(args, "OOOOOOOOO:aggregate_sparse_into", &out_o, &packed_o, &params_o, &entries_o, &weights_o,
                        &kinds_o, &bits_o, &rows_o, &offsets_o))
    return nullptr;
  at::Tensor out, params, entries, weights, kinds, rows, row_offsets;
  std::vector<at::Tensor> packed, bits;
  if (!tensor_of(out_o, "out", &out) || !tensors_of(packed_o, "packed", &packed) ||
      !tensor_of(params_o, "params", &params) || !tensor_of(entries_o, "entries", &entries) ||
      !tensor_of(weights_o, "weights", &weights) || !tensor_of(kinds_o, "kinds", &kinds) ||
      !tensors_of(bits_o, "bits", &bits) || !tensor_of(rows_o, "rows", &rows) ||
      !tensor_of(offsets_o, "row_offsets", &row_offsets))
    return nullptr;
  return run_released([&] {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("hasfl_ray::aggregate_sparse_into", "")
                               .typed<Result(const at::Tensor&, at::TensorList, const at::Tensor&, const at::Tensor&,
                                             const at::Tensor&, const at::Tensor&, at::TensorList, const at::Tensor&,
                                             const at::Tensor&)>();
    const at::AutoDispatchBelowADInplaceOrView below;
    return op.call(out, packed, params, entries, weights, kinds, bits, rows, row_offsets);
  });
}

PyMethodDef methods[] = {
    {"aggregate_into", aggregate_into_direct, METH_VARARGS,
     "torch.ops.hasfl_ray.aggregate_into(out, packed, params, entries, weights), its list read in place"},
    {"aggregate_sparse_into", aggregate_sparse_into_direct, METH_VARARGS,
     "torch.ops.hasfl_ray.aggregate_sparse_into(...), its lists read in place"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

// `import hasfl_ray._C` loads this shared library, which registers the ops below as a side effect; the module holds
// the ops' direct entries (above), and the ops are also called through torch.ops.hasfl_ray.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "hasfl_ray operator library", -1, methods};
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
