"""Entry points as kernels.toml declares them, resolved against a build's symbols
(demangled by the real c++filt, in the sandbox)."""

from __future__ import annotations

from rowgate.cuda import symbols

BUILD = ["_Z20gelu_forward_kernel1P13__nv_bfloat16PKS_i",
         "_Z20gelu_forward_kernel2P13__nv_bfloat16PKS_i",
         "_Z20gelu_forward_kernel2PfPKfi",
         "_Z6scaledIfEvPT_i",
         "decode_attention_e5m2"]


def test_the_demangler_reads_the_builds_names():
    names = symbols.demangle(BUILD)
    assert names["_Z20gelu_forward_kernel2PfPKfi"] == "gelu_forward_kernel2(float*, float const*, int)"
    assert names["decode_attention_e5m2"] == "decode_attention_e5m2"


def test_a_plain_name_is_a_symbol_else_every_cpp_function_of_that_name():
    names = symbols.demangle(BUILD)
    found, missing = symbols.resolve(["decode_attention_e5m2", "gelu_forward_kernel2",
                                      "gelu_forward_kernel3"], BUILD, names)
    assert missing == ["gelu_forward_kernel3"]
    assert [(e.declared, e.symbol) for e in found] == [
        ("decode_attention_e5m2", "decode_attention_e5m2"),
        ("gelu_forward_kernel2", "_Z20gelu_forward_kernel2P13__nv_bfloat16PKS_i"),
        ("gelu_forward_kernel2", "_Z20gelu_forward_kernel2PfPKfi")]
    # a template is not a plain name: `scaled` does not match `scaled<float>` (use a pattern)
    assert symbols.resolve(["scaled"], BUILD, names)[1] == ["scaled"]
    assert [e.shown for e in symbols.resolve(["scaled<*>"], BUILD, names)[0]] == ["scaled<float>"]


def test_what_the_build_has_is_named_for_a_missing_entry_point():
    names = symbols.demangle(BUILD)
    assert symbols.what_it_has(BUILD, names) == (
        "decode_attention_e5m2, gelu_forward_kernel1, gelu_forward_kernel2, scaled<float>")
