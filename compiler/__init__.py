"""Offline side: tiny checkpoints, profiles, hardware specs, placement, codegen, plan writing."""
