"""buildout constraint families"""
