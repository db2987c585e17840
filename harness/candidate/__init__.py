"""candidate"""
