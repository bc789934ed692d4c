/* cpu_ops.c as a CPython extension module (`pagoda_cpu_ops`), built where Python.h is found: a
   METH_FASTCALL call with integer arguments costs ~0.2 us, a ctypes call with argtypes ~2 us
   (the ops run ~1 us at T=1). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "cpu_ops.c"
/* args[0..n) as integers; args[fpos], if fpos >= 0, as a float into *f. */
static int ints(PyObject *const *args, Py_ssize_t n, Py_ssize_t want, int64_t *out, int fpos,
                float *f) {
    if (n != want) {
        PyErr_Format(PyExc_TypeError, "expected %zd arguments, got %zd", want, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i == fpos) {
            *f = (float)PyFloat_AsDouble(args[i]);
            out[i] = 0;
        } else {
            out[i] = (int64_t)PyLong_AsLongLong(args[i]);
        }
        if (PyErr_Occurred()) return -1;
    }
    return 0;
}

static PyObject *py_silu(PyObject *m, PyObject *const *args, Py_ssize_t n) {
    int64_t a[8];
    if (ints(args, n, 8, a, -1, NULL)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    pagoda_silu_mul_bf16((bf16 *)a[0], (bf16 *)a[1], (const float *)a[2], a[3], a[4], a[5], a[6],
                         (int)a[7]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_silu_f32(PyObject *m, PyObject *const *args, Py_ssize_t n) {
    int64_t a[9];
    if (ints(args, n, 9, a, -1, NULL)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    pagoda_silu_mul_f32((float *)a[0], (float *)a[1], a[2], a[3], a[4], a[5], a[6], a[7],
                        (int)a[8]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_rope(PyObject *m, PyObject *const *args, Py_ssize_t n) {
    int64_t a[10];
    if (ints(args, n, 10, a, -1, NULL)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    pagoda_rope((void *)a[0], (const void *)a[1], (int)a[2], a[3], a[4], a[5], a[6], a[7], a[8],
                (int)a[9]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_norm(PyObject *m, PyObject *const *args, Py_ssize_t n) {
    int64_t a[11];
    float eps = 0.0f;
    if (ints(args, n, 11, a, 8, &eps)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    pagoda_rms_norm((void *)a[0], (void *)a[1], (const void *)a[2], (void *)a[3], (int)a[4], a[5],
                    a[6], a[7], eps, (int)a[9], (int)a[10]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"pagoda_silu_mul_bf16", (PyCFunction)(void (*)(void))py_silu, METH_FASTCALL, NULL},
    {"pagoda_silu_mul_f32", (PyCFunction)(void (*)(void))py_silu_f32, METH_FASTCALL, NULL},
    {"pagoda_rope", (PyCFunction)(void (*)(void))py_rope, METH_FASTCALL, NULL},
    {"pagoda_rms_norm", (PyCFunction)(void (*)(void))py_norm, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "pagoda_cpu_ops", NULL, -1, methods};

PyMODINIT_FUNC PyInit_pagoda_cpu_ops(void) { return PyModule_Create(&module); }
