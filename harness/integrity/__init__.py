"""integrity"""
