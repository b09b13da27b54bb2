"""Prompts: what a prompt may know (context), its text pieces and fields, the templates
(``prompts/*.md``) and compile diagnostics for repair prompts."""
