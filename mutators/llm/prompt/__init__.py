"""Prompts: what a prompt may know (context), its text pieces and fields, the templates
(``prompts/*.md``), an attempt's prompt sized to its model (builder, counting tokens where a
tokenizer is known: tokens), the CuTe reference card (card), the parent's source with the code its task
never compiles elided (elide, over ppscan and ppcond) and compile diagnostics for repair
prompts."""
