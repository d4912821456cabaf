"""experts constraint families"""
