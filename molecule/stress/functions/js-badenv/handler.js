// stress-js-badenv: reads a property of an undefined setting: a TypeError on purpose.
exports.handle = async () => {
  const settings = process.env.SLESS_STRESS_MISSING_SETTINGS;
  return { length: settings.length };
};
