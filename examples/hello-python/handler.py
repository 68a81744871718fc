def handle(event):
    name = event.get("name") or event.get("_query", {}).get("name") or "world"
    return {"message": f"Hello, {name}!", "runtime": "python3.11"}
