"""overlay.seq"""
