# expected: pass
# The output of level0/6 is always zero (the mean over a single column is that column), so the fastest correct
# answer writes zeros with a tiny C++ kernel; its backward is zero too. The judge passes it and marks the record
# `degenerate_problem`: its speedup says nothing about kernels. The C++ source includes only Python.h, so it builds
# in about a second (load_inline would prepend torch/extension.h, about 20 s on 2 cores).
import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load

SOURCE = r"""
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject* fill_zero(PyObject*, PyObject* args) {   // fill_zero(address, nbytes): zero bits are 0.0
    unsigned long long address;
    long long nbytes;
    if (!PyArg_ParseTuple(args, "KL", &address, &nbytes)) return NULL;
    memset((void*)(uintptr_t)address, 0, (size_t)nbytes);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fill_zero", fill_zero, METH_VARARGS, "fill_zero(address, nbytes): zeros a floating-point buffer"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "ext", NULL, -1, methods};

PyMODINIT_FUNC PyInit_ext(void) { return PyModule_Create(&module); }
"""

path = os.path.join(tempfile.gettempdir(), "zeros_ext.cpp")
with open(path, "w") as f:
    f.write(SOURCE)
ext = load(name="ext", sources=[path], extra_cflags=["-O2"], verbose=False)


class Zeros(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        out = torch.empty(x.shape[0], 1, dtype=x.dtype)
        ext.fill_zero(out.data_ptr(), out.numel() * out.element_size())
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, bias = ctx.saved_tensors
        return torch.zeros_like(x), torch.zeros_like(weight), torch.zeros_like(bias)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, max_dim):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)   # the reference's weights load here; the output ignores them

    def forward(self, x):
        return Zeros.apply(x, self.gemm.weight, self.gemm.bias)
