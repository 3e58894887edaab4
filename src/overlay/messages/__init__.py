"""overlay.messages"""
