"""populations"""
