"""timing"""
