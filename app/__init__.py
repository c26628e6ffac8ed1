"""LLaMA Explorer's Streamlit app."""
