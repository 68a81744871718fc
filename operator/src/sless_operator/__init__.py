"""The sless Kopf operator: reconciles Function, Trigger and FunctionJob resources."""
