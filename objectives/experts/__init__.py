"""experts objective families"""
