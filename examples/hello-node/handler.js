exports.handle = async (event) => {
  const name = event.name || (event._query || {}).name || "world";
  return { message: `Hello, ${name}!`, runtime: "nodejs20" };
};
