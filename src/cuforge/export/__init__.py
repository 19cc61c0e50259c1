"""cuforge.export"""
