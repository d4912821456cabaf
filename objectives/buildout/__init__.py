"""buildout objective families"""
