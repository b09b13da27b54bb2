"""mutators"""
