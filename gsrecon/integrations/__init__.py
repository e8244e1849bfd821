"""Integrations of gsrecon into other tools: a nerfbaselines method."""
