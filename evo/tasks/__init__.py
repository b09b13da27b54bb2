"""evo/tasks"""
