"""A kernel's launch arguments (kernel_args.converter, decided once per kernel): what cuda.core is passed for
each parameter type, and the one-line refusals of values that do not fit. The launches themselves are
the GPU tests'."""

import pytest


def test_a_kernel_s_arguments_convert_as_its_parameters_say_and_bad_ones_are_named():
    """What a launch passes for each parameter (decided once a kernel by runtime.converter), and the
    one-line refusals of values that do not fit."""
    import numpy as np
    import torch

    from cuforge.kernel_args import LaunchError, Param, convert_arg

    assert convert_arg(Param("n", "int", False), 123) == np.int32(123)
    assert convert_arg(Param("n", "int", False), 123).dtype == np.int32
    assert convert_arg(Param("u", "unsigned char", False), 255).dtype == np.uint8
    assert convert_arg(Param("b", "bool", False), True) == np.True_
    assert convert_arg(Param("s", "float", False), 0.5).dtype == np.float32
    assert convert_arg(Param("h", "__half", False), 2).dtype == np.float16
    assert convert_arg(Param("x", "float", True), None) == np.uint64(0)
    assert convert_arg(Param("x", "float", True), 4096) == np.uint64(4096)
    tmap = object()
    assert convert_arg(Param("m", "CUtensorMap", False), tmap) is tmap  # a struct by value passes as it is
    for param, value, message in [
        (Param("n", "int", False), 2**31, "argument 'n': 2147483648 does not fit int"),
        (Param("u", "unsigned char", False), -1, "argument 'u': -1 does not fit unsigned char"),
        (Param("n", "int", False), 1.5, "argument 'n' is int but got non-integer 1.5"),
        (Param("n", "int", False), torch.ones(1), "argument 'n' is a int scalar but got a tensor"),
        (Param("x", "float", True), torch.ones(1), "argument 'x': tensor is on cpu, not on a CUDA device"),
        (Param("x", "float", True), "s", "argument 'x' is a pointer (float*) but got str"),
    ]:
        with pytest.raises(LaunchError) as err:
            convert_arg(param, value)
        assert str(err.value) == message
