"""Optional integrations with other libraries (imported on demand, never by `import samattn`)."""
