"""ctrlrun"""
