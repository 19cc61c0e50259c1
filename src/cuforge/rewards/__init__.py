"""cuforge.rewards"""
