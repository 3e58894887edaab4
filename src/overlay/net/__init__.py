"""overlay.net"""
