# cmake/HonedTorch.cmake: the imported target honed::torch, from the torch Python package of
# Python_EXECUTABLE (the project's venv; never another torch).
#
# Why not find_package(Torch): TorchConfig.cmake of a CUDA wheel requires a CUDA toolkit (nvcc,
# CUDA headers) at configure time, which a pip-installed torch does not need to run, and which the
# runtime does not need either (it calls CUDA only through libtorch and the engine's run-time
# loaded libcudart). So the include folders, the libraries and the C++ ABI flag are read from the
# package itself; HONED_TORCH_FIND_PACKAGE=ON uses find_package(Torch) with
# torch.utils.cmake_prefix_path instead.
# Sets HONED_TORCH_FOUND, HONED_TORCH_VERSION, HONED_TORCH_CUDA (ON for a CUDA build) and
# HONED_TORCH_LIBDIR.
option(HONED_TORCH_FIND_PACKAGE "Use find_package(Torch) instead of reading the torch package" OFF)
set(HONED_TORCH_FOUND OFF)
if(NOT Python_EXECUTABLE)
  find_package(Python 3.10 COMPONENTS Interpreter QUIET)
endif()
if(Python_EXECUTABLE)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__.split('+')[0]); print(int(torch.compiled_with_cxx11_abi())); print(torch.utils.cmake_prefix_path)"
    RESULT_VARIABLE _honed_torch_rc OUTPUT_VARIABLE _honed_torch_out ERROR_QUIET
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_honed_torch_rc EQUAL 0)
    string(REPLACE "\n" ";" _honed_torch_out "${_honed_torch_out}")
    list(GET _honed_torch_out 0 HONED_TORCH_DIR)
    list(GET _honed_torch_out 1 HONED_TORCH_VERSION)
    list(GET _honed_torch_out 2 _honed_torch_abi)
    list(GET _honed_torch_out 3 _honed_torch_prefix)
    set(HONED_TORCH_FOUND ON)
  endif()
endif()

if(HONED_TORCH_FOUND)
  set(HONED_TORCH_LIBDIR "${HONED_TORCH_DIR}/lib")
  set(HONED_TORCH_CUDA OFF)
  if(EXISTS "${HONED_TORCH_LIBDIR}/libtorch_cuda.so")
    set(HONED_TORCH_CUDA ON)
  endif()
  add_library(honed::torch INTERFACE IMPORTED)
  if(HONED_TORCH_FIND_PACKAGE)
    find_package(Torch REQUIRED PATHS "${_honed_torch_prefix}" NO_DEFAULT_PATH)
    target_link_libraries(honed::torch INTERFACE ${TORCH_LIBRARIES})
  else()
    # libtorch and libtorch_cuda register the CPU / CUDA AOTInductor runners when they load: keep
    # them linked although no symbol of theirs is named (--no-as-needed).
    set(_honed_torch_libs "-Wl,--no-as-needed" "${HONED_TORCH_LIBDIR}/libtorch.so")
    if(HONED_TORCH_CUDA)
      list(APPEND _honed_torch_libs "${HONED_TORCH_LIBDIR}/libtorch_cuda.so")
    endif()
    list(APPEND _honed_torch_libs "-Wl,--as-needed" "${HONED_TORCH_LIBDIR}/libtorch_cpu.so"
         "${HONED_TORCH_LIBDIR}/libc10.so")
    if(HONED_TORCH_CUDA)
      list(APPEND _honed_torch_libs "${HONED_TORCH_LIBDIR}/libc10_cuda.so")
    endif()
    target_include_directories(honed::torch SYSTEM INTERFACE
      "${HONED_TORCH_DIR}/include" "${HONED_TORCH_DIR}/include/torch/csrc/api/include")
    target_compile_definitions(honed::torch INTERFACE
      _GLIBCXX_USE_CXX11_ABI=${_honed_torch_abi})
    target_link_libraries(honed::torch INTERFACE ${_honed_torch_libs})
    target_link_directories(honed::torch INTERFACE "${HONED_TORCH_LIBDIR}")
  endif()
  message(STATUS "torch ${HONED_TORCH_VERSION} (CUDA build: ${HONED_TORCH_CUDA}) at ${HONED_TORCH_DIR}")
endif()
