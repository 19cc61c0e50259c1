"""The offline proposer: parameterized CUDA kernel families (jinja2-rendered) and their search."""
