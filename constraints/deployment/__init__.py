"""deployment constraint families"""
