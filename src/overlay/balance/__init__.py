"""overlay.balance"""
