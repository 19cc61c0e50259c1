"""The C type of each tensor dtype in the exported C API and its generated tests."""

from __future__ import annotations


C_TYPES = {"float16": "__half", "float32": "float", "float64": "double", "bfloat16": "__nv_bfloat16",
           "int64": "int64_t", "int32": "int32_t", "int8": "int8_t", "uint8": "uint8_t", "bool": "bool"}
