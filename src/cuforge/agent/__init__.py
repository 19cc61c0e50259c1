"""cuforge.agent"""
