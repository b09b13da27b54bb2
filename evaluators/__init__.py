"""evaluators"""
