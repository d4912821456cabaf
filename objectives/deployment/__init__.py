"""deployment objective families"""
