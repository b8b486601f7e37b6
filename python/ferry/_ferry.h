/*
 * Shared by the C files of the _ferry extension (not installed, not public): what _ckpt.c needs
 * from _ferry.c. Hidden, so that the module exports PyInit__ferry only.
 */
#ifndef FERRY_PY_FERRY_H
#define FERRY_PY_FERRY_H

#include <Python.h>

#include "ferry/ferry.h"

#define FERRY_PY_HIDDEN __attribute__((visibility("hidden")))

/* Sets the exception for err (negative) with ferry_last_error()'s detail; returns NULL. */
FERRY_PY_HIDDEN PyObject *ferry__py_raise(int err, PyObject *filename);
/* The ferry_ctx of a ferry.Context, or NULL with TypeError set. */
FERRY_PY_HIDDEN ferry_ctx *ferry__py_ctx(PyObject *obj);
/* _ckpt.c: adds the safetensors and checkpoint types and functions to the module. */
FERRY_PY_HIDDEN int ferry__py_ckpt_init(PyObject *m);

#endif
