"""The template search's kernel library: parameterized CUDA kernel families (jinja2-rendered `.cu.j2`
beside the module that matches and configures each) and the fused-epilogue chains they share. The
proposer that searches over them is one proposer among others (cuforge.agent.template_proposer)."""
