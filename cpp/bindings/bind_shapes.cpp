// cpp/bindings/bind_shapes.cpp: bindings of the engine's shapes and dispatch parts (types only).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <charconv>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "honed/dispatch.h"
#include "honed/shapes.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace honed::py {
namespace {

// Python objects -> SignatureBuilder calls. The hot path (Dispatcher.lookup) goes through the
// C API on borrowed handles and caches the strings it needs, so a warm call allocates only the
// torch.Size tuple that `x.shape` returns.
struct Converter {
  PyObject* tensor_type = nullptr;  // strong reference, set by set_tensor_type
  PyObject* s_shape = PyUnicode_InternFromString("shape");
  PyObject* s_dtype = PyUnicode_InternFromString("dtype");
  PyObject* s_is_cuda = PyUnicode_InternFromString("is_cuda");
  PyObject* s_is_cpu = PyUnicode_InternFromString("is_cpu");
  PyObject* s_get_device = PyUnicode_InternFromString("get_device");
  PyObject* s_device = PyUnicode_InternFromString("device");
  // The data descriptors (getters) that `x.shape` etc. resolve to on the registered type itself;
  // for instances of exactly that type they are called directly, skipping the attribute lookup.
  PyObject* d_shape = nullptr;
  PyObject* d_dtype = nullptr;
  PyObject* d_is_cuda = nullptr;
  PyObject* d_is_cpu = nullptr;
  std::vector<std::pair<PyObject*, std::string>> dtypes;  // torch.dtype object -> "float32"
  std::vector<std::string> cuda_devices;                  // index -> "cuda:N"
};

Converter& conv() {
  static Converter* c = new Converter();  // lives as long as the process, like the dtypes
  return *c;
}

nb::object steal_or_throw(PyObject* o) {
  if (!o) throw nb::python_error();
  return nb::steal(o);
}

// A data descriptor of `type` for `name`, or nullptr (then the plain attribute lookup is used).
PyObject* data_descriptor(PyObject* type, PyObject* name) {
  PyObject* d = PyObject_GetAttr(type, name);
  if (!d) {
    PyErr_Clear();
    return nullptr;
  }
  if (!Py_TYPE(d)->tp_descr_get || !Py_TYPE(d)->tp_descr_set) {
    Py_DECREF(d);
    return nullptr;
  }
  return d;
}

// x.<name>, through the cached descriptor when x is exactly the registered tensor type.
nb::object tensor_attr(PyObject* tensor, PyObject* descr, PyObject* name) {
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(tensor));
  if (descr && type == conv().tensor_type) {
    return steal_or_throw(Py_TYPE(descr)->tp_descr_get(descr, tensor, type));
  }
  return steal_or_throw(PyObject_GetAttr(tensor, name));
}

std::string utf8(nb::handle str) {
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(str.ptr(), &n);
  if (!p) throw nb::python_error();
  return std::string(p, static_cast<size_t>(n));
}

std::string repr_of(nb::handle o) { return utf8(steal_or_throw(PyObject_Repr(o.ptr()))); }

std::string type_name(nb::handle o) {
  return utf8(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(o.ptr()))).attr("__name__"));
}

const std::string& dtype_of(PyObject* tensor) {
  Converter& c = conv();
  nb::object dt = tensor_attr(tensor, c.d_dtype, c.s_dtype);
  for (const auto& [obj, name] : c.dtypes) {
    if (obj == dt.ptr()) return name;
  }
  std::string name = utf8(nb::str(dt));
  if (name.rfind("torch.", 0) == 0) name.erase(0, 6);
  c.dtypes.emplace_back(dt.release().ptr(), std::move(name));
  return c.dtypes.back().second;
}

// "cpu" / "cuda:N" without building a torch.device; other devices via str(x.device).
std::string_view device_of(PyObject* tensor, std::string& scratch) {
  Converter& c = conv();
  nb::object is_cuda = tensor_attr(tensor, c.d_is_cuda, c.s_is_cuda);
  if (is_cuda.ptr() == Py_True) {
    nb::object idx = steal_or_throw(PyObject_CallMethodNoArgs(tensor, c.s_get_device));
    const long i = PyLong_AsLong(idx.ptr());
    if (i < 0) throw nb::python_error();
    while (c.cuda_devices.size() <= static_cast<size_t>(i)) {
      c.cuda_devices.push_back("cuda:" + std::to_string(c.cuda_devices.size()));
    }
    return c.cuda_devices[static_cast<size_t>(i)];
  }
  nb::object is_cpu = tensor_attr(tensor, c.d_is_cpu, c.s_is_cpu);
  if (is_cpu.ptr() == Py_True) return "cpu";
  scratch = utf8(nb::str(steal_or_throw(PyObject_GetAttr(tensor, c.s_device))));
  return scratch;
}

void add_tensor(PyObject* tensor, SignatureBuilder& b) {
  const Converter& c = conv();
  nb::object shape = tensor_attr(tensor, c.d_shape, c.s_shape);
  if (!PyTuple_Check(shape.ptr())) throw nb::type_error("tensor.shape is not a tuple");
  const Py_ssize_t rank = PyTuple_GET_SIZE(shape.ptr());
  int64_t small[8];
  std::vector<int64_t> large;
  int64_t* dims = small;
  if (rank > 8) {
    large.resize(static_cast<size_t>(rank));
    dims = large.data();
  }
  for (Py_ssize_t i = 0; i < rank; ++i) {
    dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
    if (dims[i] == -1 && PyErr_Occurred()) throw nb::python_error();
  }
  std::string scratch;
  const std::string& dtype = dtype_of(tensor);
  b.tensor(dtype, device_of(tensor, scratch), std::span<const int64_t>(dims, rank));
}

void walk(PyObject* o, SignatureBuilder& b, int depth);

void walk_dict(PyObject* o, SignatureBuilder& b, int depth, std::string_view type_name) {
  b.open('{', type_name);
  Py_ssize_t pos = 0;
  PyObject *key, *value;
  while (PyDict_Next(o, &pos, &key, &value)) {
    if (PyUnicode_Check(key)) {
      Py_ssize_t n = 0;
      const char* p = PyUnicode_AsUTF8AndSize(key, &n);
      if (!p) throw nb::python_error();
      b.key(std::string_view(p, static_cast<size_t>(n)), true);
    } else {
      b.key(repr_of(key), false);
    }
    walk(value, b, depth + 1);
  }
  b.close('}');
}

void walk_sequence(PyObject* o, SignatureBuilder& b, int depth, char open, char close,
                   std::string_view type_name) {
  b.open(open, type_name);
  nb::object seq = steal_or_throw(PySequence_Fast(o, "not a sequence"));
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  for (Py_ssize_t i = 0; i < n; ++i) walk(items[i], b, depth + 1);
  b.close(close);
}

void walk(PyObject* o, SignatureBuilder& b, int depth) {
  const Converter& c = conv();
  if (depth > 64) throw std::invalid_argument("inputs are nested more than 64 levels deep");
  PyTypeObject* t = Py_TYPE(o);
  if (reinterpret_cast<PyObject*>(t) == c.tensor_type) return add_tensor(o, b);
  if (o == Py_None) return b.constant("None");
  if (o == Py_True) return b.constant("True");
  if (o == Py_False) return b.constant("False");
  if (t == &PyLong_Type) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (!overflow) {
      char buf[24];
      auto res = std::to_chars(buf, buf + sizeof(buf), v);
      return b.constant(std::string_view(buf, static_cast<size_t>(res.ptr - buf)));
    }
    return b.constant(repr_of(o));
  }
  if (t == &PyTuple_Type) return walk_sequence(o, b, depth, '(', ')', {});
  if (t == &PyList_Type) return walk_sequence(o, b, depth, '[', ']', {});
  if (t == &PyDict_Type) return walk_dict(o, b, depth, {});
  if (!c.tensor_type) {
    throw std::runtime_error("honed._core.set_tensor_type(torch.Tensor) was not called");
  }
  const int is_tensor = PyObject_IsInstance(o, c.tensor_type);
  if (is_tensor < 0) throw nb::python_error();
  if (is_tensor) return add_tensor(o, b);
  if (PyLong_Check(o) || PyFloat_Check(o) || PyUnicode_Check(o)) return b.constant(repr_of(o));
  // Subclasses (namedtuple, OrderedDict, ...) keep their type name in the structure.
  if (PyTuple_Check(o)) return walk_sequence(o, b, depth, '(', ')', type_name(o));
  if (PyList_Check(o)) return walk_sequence(o, b, depth, '[', ']', type_name(o));
  if (PyDict_Check(o)) return walk_dict(o, b, depth, type_name(o));
  b.constant("<" + type_name(o) + ">");
}

// The call f(*args, **kwargs) as "(args,kwargs)".
void walk_call(nb::handle args, nb::handle kwargs, SignatureBuilder& b, bool keep_leaves) {
  if (!PyTuple_Check(args.ptr())) throw nb::type_error("args must be a tuple");
  if (!kwargs.is_none() && !PyDict_Check(kwargs.ptr()))
    throw nb::type_error("kwargs must be a dict");
  b.reset(keep_leaves);
  b.open('(');
  walk_sequence(args.ptr(), b, 1, '(', ')', {});
  if (kwargs.is_none()) {
    b.open('{');
    b.close('}');
  } else {
    walk_dict(kwargs.ptr(), b, 1, {});
  }
  b.close(')');
}

Signature make_signature(nb::handle args, nb::handle kwargs) {
  SignatureBuilder b;
  walk_call(args, kwargs, b, true);
  return b.signature();
}

// A Dispatcher plus the Python callables its variant ids stand for (binding glue only).
struct RoutingDispatcher : Dispatcher {
  std::vector<nb::object> targets;
};

// Walks a call into a reused builder (keep_leaves=false) and hands it to `use`. A tensor
// subclass's attribute may call back in: a builder in use is never reused.
template <typename Use>
auto with_fast_walk(nb::handle args, nb::handle kwargs, const Use& use) {
  thread_local SignatureBuilder shared;
  thread_local bool busy = false;
  if (busy) {
    SignatureBuilder local;
    walk_call(args, kwargs, local, false);
    return use(local);
  }
  busy = true;
  try {
    walk_call(args, kwargs, shared, false);
  } catch (...) {
    busy = false;
    throw;
  }
  busy = false;
  return use(shared);
}

int fast_lookup(const Dispatcher& d, nb::handle args, nb::handle kwargs) {
  return with_fast_walk(args, kwargs, [&](const SignatureBuilder& b) { return d.lookup(b); });
}

AxisOverride to_override(nb::handle key, nb::handle value) {
  if (PyLong_Check(value.ptr()) && !PyBool_Check(value.ptr())) return nb::cast<int64_t>(value);
  if (nb::isinstance<DynamicDim>(value)) return nb::cast<DynamicDim>(value);
  if (nb::isinstance<BatchDim>(value)) return nb::cast<BatchDim>(value);
  throw std::invalid_argument(
      "dynamic_shapes[" + repr_of(key) + "] is " + repr_of(value) +
      ": use an int (fixed size), DynamicDim(name, min, max) or BatchDim()");
}

Overrides to_overrides(nb::handle overrides) {
  Overrides out;
  if (overrides.is_none()) return out;
  if (!PyDict_Check(overrides.ptr())) {
    throw std::invalid_argument(
        "overrides must be a dict {(input index, axis): int | DynamicDim | BatchDim}");
  }
  for (auto [key, value] : nb::borrow<nb::dict>(overrides)) {
    std::pair<int, int> where;
    if (!nb::try_cast(key, where)) {
      throw std::invalid_argument("dynamic_shapes key " + repr_of(key) +
                                  " must be a tuple (tensor input index, axis)");
    }
    out[where] = to_override(key, value);
  }
  return out;
}

std::string axis_repr(const Axis& a) {
  return std::string("Axis(") + to_string(a.kind) + ", '" + a.name +
         "', min=" + std::to_string(a.min) + ", opt=" + std::to_string(a.opt) +
         ", max=" + std::to_string(a.max) + ")";
}

}  // namespace

void bind_shapes(nb::module_& m) {
  m.def("set_tensor_type", [](nb::handle type) {
    if (!PyType_Check(type.ptr())) throw nb::type_error("set_tensor_type expects a type");
    Converter& c = conv();
    for (PyObject** d : {&c.d_shape, &c.d_dtype, &c.d_is_cuda, &c.d_is_cpu}) Py_CLEAR(*d);
    Py_XDECREF(c.tensor_type);
    c.tensor_type = nb::borrow(type).release().ptr();
    c.d_shape = data_descriptor(c.tensor_type, c.s_shape);
    c.d_dtype = data_descriptor(c.tensor_type, c.s_dtype);
    c.d_is_cuda = data_descriptor(c.tensor_type, c.s_is_cuda);
    c.d_is_cpu = data_descriptor(c.tensor_type, c.s_is_cpu);
  });

  nb::class_<Signature>(m, "Signature")
      .def_ro("structure", &Signature::structure)
      .def_prop_ro("graph_key", [](const Signature& s) { return graph_key(s); })
      .def_prop_ro("tensor_shapes",
                   [](const Signature& s) {
                     std::vector<std::vector<int64_t>> out;
                     for (const TensorSpec& t : tensor_specs(s)) out.push_back(t.shape);
                     return out;
                   })
      .def_prop_ro("tensor_dtypes",
                   [](const Signature& s) {
                     std::vector<std::string> out;
                     for (const TensorSpec& t : tensor_specs(s)) out.push_back(t.dtype);
                     return out;
                   })
      .def_prop_ro("tensor_devices",
                   [](const Signature& s) {
                     std::vector<std::string> out;
                     for (const TensorSpec& t : tensor_specs(s)) out.push_back(t.device);
                     return out;
                   })
      .def_prop_ro("num_tensors", [](const Signature& s) { return tensor_specs(s).size(); })
      .def("__eq__", [](const Signature& a, const Signature& b) { return a == b; })
      .def("__repr__", [](const Signature& s) { return "Signature(" + describe(s) + ")"; });

  m.def("signature", &make_signature, "args"_a, "kwargs"_a);

  nb::class_<DynamicDim>(m, "DynamicDim")
      .def(
          "__init__",
          [](DynamicDim* self, std::string name, int64_t min, int64_t max,
             std::optional<int64_t> opt) { new (self) DynamicDim{std::move(name), min, max, opt}; },
          "name"_a, "min"_a, "max"_a, "opt"_a = nb::none())
      .def_rw("name", &DynamicDim::name)
      .def_rw("min", &DynamicDim::min)
      .def_rw("max", &DynamicDim::max)
      .def_rw("opt", &DynamicDim::opt)
      .def("__eq__", [](const DynamicDim& a, const DynamicDim& b) { return a == b; })
      .def("__repr__", [](const DynamicDim& d) {
        return "DynamicDim('" + d.name + "', min=" + std::to_string(d.min) +
               ", max=" + std::to_string(d.max) +
               ", opt=" + (d.opt ? std::to_string(*d.opt) : "None") + ")";
      });

  nb::class_<BatchDim>(m, "BatchDim")
      .def(
          "__init__",
          [](BatchDim* self, int64_t min, std::optional<int64_t> max) {
            new (self) BatchDim{min, max};
          },
          "min"_a = 1, "max"_a = nb::none())
      .def_rw("min", &BatchDim::min)
      .def_rw("max", &BatchDim::max)
      .def("__eq__", [](const BatchDim& a, const BatchDim& b) { return a == b; })
      .def("__repr__", [](const BatchDim& d) {
        return "BatchDim(min=" + std::to_string(d.min) +
               ", max=" + (d.max ? std::to_string(*d.max) : "None") + ")";
      });

  nb::class_<Axis>(m, "Axis")
      .def_prop_ro("kind", [](const Axis& a) { return std::string(to_string(a.kind)); })
      .def_ro("name", &Axis::name)
      .def_ro("min", &Axis::min)
      .def_ro("opt", &Axis::opt)
      .def_ro("max", &Axis::max)
      .def("__eq__", [](const Axis& a, const Axis& b) { return a == b; })
      .def("__repr__", &axis_repr);

  nb::class_<GraphProfile>(m, "GraphProfile")
      .def_ro("graph_key", &GraphProfile::graph_key)
      .def_ro("axes", &GraphProfile::axes)
      .def_ro("batch_axes", &GraphProfile::batch_axes)
      .def_ro("min_batch", &GraphProfile::min_batch)
      .def_ro("opt_batch", &GraphProfile::opt_batch)
      .def_ro("max_batch", &GraphProfile::max_batch)
      .def_prop_ro("has_dynamic", [](const GraphProfile& p) { return has_dynamic(p); })
      .def("min_shapes", [](const GraphProfile& p) { return min_shapes(p); })
      .def("opt_shapes", [](const GraphProfile& p) { return opt_shapes(p); })
      .def("max_shapes", [](const GraphProfile& p) { return max_shapes(p); })
      .def(
          "check",
          [](const GraphProfile& p, const Signature& s) {
            ShapeCheck c = check(p, s);
            return std::make_pair(c.ok, std::move(c.reason));
          },
          "sig"_a)
      .def("to_json", [](const GraphProfile& p) { return to_json(p); })
      .def_static(
          "from_json", [](const std::string& s) { return profile_from_json(s); }, "s"_a)
      // Pickled as its JSON, so what carries a profile can go to a worker process.
      .def("__getstate__", [](const GraphProfile& p) { return std::make_tuple(to_json(p)); })
      .def("__setstate__",
           [](GraphProfile& p, const std::tuple<std::string>& state) {
             new (&p) GraphProfile(profile_from_json(std::get<0>(state)));
           })
      .def("__eq__", [](const GraphProfile& a, const GraphProfile& b) { return a == b; })
      .def("__repr__", [](const GraphProfile& p) { return "GraphProfile(" + to_json(p) + ")"; });

  m.def(
      "infer_profile",
      [](const std::vector<Signature>& samples, nb::handle overrides) {
        return infer_profile(samples, to_overrides(overrides));
      },
      "samples"_a, "overrides"_a = nb::none());

  m.def("batch_indices", &batch_indices, "current"_a, "target"_a);

  // The hot path of honed.Module.__call__: look up the variant and call it in one C++ call.
  // A miss returns the `MISS` sentinel; the Python side then runs eager (and says why once).
  m.attr("MISS") = nb::module_::import_("builtins").attr("object")();
  nb::object miss = m.attr("MISS");

  nb::class_<RoutingDispatcher>(m, "Dispatcher")
      .def(nb::init<>())
      .def("add", &RoutingDispatcher::add, "profile"_a, "variant"_a)
      .def("clear",
           [](RoutingDispatcher& d) {
             d.clear();
             d.targets.clear();
           })
      .def("__len__", &RoutingDispatcher::size)
      .def(
          "lookup",
          [](const RoutingDispatcher& d, nb::handle args, nb::handle kwargs) {
            return fast_lookup(d, args, kwargs);
          },
          "args"_a, "kwargs"_a)
      .def(
          "set_targets",
          [](RoutingDispatcher& d, std::vector<nb::object> targets) {
            d.targets = std::move(targets);
          },
          "targets"_a, "The callables of variants 0..n-1, used by call().")
      .def(
          "call",
          [miss](RoutingDispatcher& d, nb::handle args, nb::handle kwargs) -> nb::object {
            const int v = fast_lookup(d, args, kwargs);
            if (v < 0 || static_cast<size_t>(v) >= d.targets.size()) return miss;
            PyObject* kw = PyDict_Check(kwargs.ptr()) && PyDict_GET_SIZE(kwargs.ptr()) > 0
                               ? kwargs.ptr()
                               : nullptr;
            PyObject* out = PyObject_Call(d.targets[static_cast<size_t>(v)].ptr(), args.ptr(), kw);
            if (out == nullptr) throw nb::python_error();
            return nb::steal(out);
          },
          "args"_a, "kwargs"_a)
      .def(
          "explain",
          [](const RoutingDispatcher& d, nb::handle args, nb::handle kwargs) {
            return d.lookup(make_signature(args, kwargs)).reason;
          },
          "args"_a, "kwargs"_a);

  // A compiled payload's accepted inputs (see dispatch.h); fits() walks the call like lookup().
  nb::class_<InputGuard>(m, "InputGuard")
      .def(nb::init<GraphProfile>(), "profile"_a)
      .def_prop_ro("profile", &InputGuard::profile)
      .def(
          "fits",
          [](const InputGuard& g, nb::handle args, nb::handle kwargs) {
            return with_fast_walk(args, kwargs,
                                  [&](const SignatureBuilder& b) { return g.fits(b); });
          },
          "args"_a, "kwargs"_a)
      .def(
          "explain",
          [](const InputGuard& g, nb::handle args, nb::handle kwargs) {
            return g.explain(make_signature(args, kwargs));
          },
          "args"_a, "kwargs"_a);
}

}  // namespace honed::py
